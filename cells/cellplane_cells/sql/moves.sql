-- Online tenant moves (moves.py): the source's scope pages, change capture
-- reads, freeze and finish; the target's upserts; checksums on both sides.
-- Rows travel in row_to_json's shape, as in transfer.sql. The move's scope:
-- the tenant row, wallet, bucket, targets, webhooks, queued and running jobs
-- with their steps and ledger rows, every idempotency key, the events
-- not yet delivered everywhere (unrelayed, or with a pending delivery), and
-- every schedule with its run history (0009; captured since 0013).
--
-- Scope pages are keyset-paged; a page's `cursor` column is the key of its
-- row, as a JSON array, and `%(after)s` the last one returned (NULL: start).
-- Jobs are read as two index scans, queued (jobs_queued) and running (few),
-- never through the tenant's whole job history.

-- name: declare_tenant_admin
-- The transaction is the move's own admin path: the tenant fence (0006)
-- lets its writes through. Transaction-local.
SELECT set_config('cellplane.tenant_admin', 'on', true);

-- name: lock_tenant_for_move
-- The tenant row first, then the advisory lock (0006's lock order). FOR NO
-- KEY UPDATE does not wait for writers' foreign-key KEY SHARE locks, so a
-- writer that holds the shared advisory lock is never waiting on us while
-- we wait for it.
SELECT tenant_id, state, epoch, move_id, capturing FROM tenants
 WHERE tenant_id = %(tenant_id)s
   FOR NO KEY UPDATE;

-- name: exclusive_tenant_lock
-- Waits for every transaction that passed the fence for this tenant to end,
-- and keeps new ones waiting until this transaction ends.
SELECT pg_advisory_xact_lock(1129339988, cellplane_tenant_lock_key(%(tenant_id)s));

-- name: start_capture
UPDATE tenants SET move_id = %(move_id)s, capturing = true, updated_at = now()
 WHERE tenant_id = %(tenant_id)s;

-- name: clear_changes
DELETE FROM tenant_changes WHERE tenant_id = %(tenant_id)s;

-- name: scope_totals
SELECT json_build_object(
    'tenant', (SELECT count(*) FROM tenants WHERE tenant_id = %(tenant_id)s),
    'wallet', (SELECT count(*) FROM wallets WHERE tenant_id = %(tenant_id)s),
    'rate_bucket', (SELECT count(*) FROM rate_buckets WHERE tenant_id = %(tenant_id)s),
    'targets', (SELECT count(*) FROM targets WHERE tenant_id = %(tenant_id)s),
    'webhooks', (SELECT count(*) FROM webhook_endpoints WHERE tenant_id = %(tenant_id)s),
    'jobs', (SELECT count(*) FROM jobs WHERE tenant_id = %(tenant_id)s AND status = 'queued')
          + (SELECT count(*) FROM jobs WHERE tenant_id = %(tenant_id)s AND status = 'running'),
    'steps', (SELECT count(*) FROM job_steps s JOIN jobs j USING (job_id)
               WHERE j.tenant_id = %(tenant_id)s AND j.status IN ('queued', 'running')),
    'ledger', (SELECT count(*) FROM ledger l JOIN jobs j USING (job_id)
                WHERE j.tenant_id = %(tenant_id)s AND j.status IN ('queued', 'running')),
    'idempotency_keys', (SELECT count(*) FROM idempotency_keys WHERE tenant_id = %(tenant_id)s),
    'outbox', (SELECT count(*) FROM outbox o
                WHERE o.tenant_id = %(tenant_id)s
                  AND (o.relayed_at IS NULL OR EXISTS (
                       SELECT 1 FROM deliveries d WHERE d.event_id = o.event_id AND d.status = 'pending'))),
    'schedules', (SELECT count(*) FROM schedules WHERE tenant_id = %(tenant_id)s),
    'schedule_runs', (SELECT count(*) FROM schedule_runs WHERE tenant_id = %(tenant_id)s)
) AS totals;

-- name: page_tenant
SELECT row_to_json(t) AS row, NULL::jsonb AS cursor FROM tenants t WHERE t.tenant_id = %(tenant_id)s;

-- name: page_wallet
SELECT row_to_json(w) AS row, NULL::jsonb AS cursor FROM wallets w WHERE w.tenant_id = %(tenant_id)s;

-- name: page_rate_bucket
SELECT row_to_json(b) AS row, NULL::jsonb AS cursor FROM rate_buckets b WHERE b.tenant_id = %(tenant_id)s;

-- name: page_targets
SELECT row_to_json(g) AS row, jsonb_build_array(g.name) AS cursor
  FROM targets g
 WHERE g.tenant_id = %(tenant_id)s AND g.name > coalesce(%(after)s::jsonb->>0, '')
 ORDER BY g.name LIMIT %(limit)s;

-- name: page_webhooks
SELECT row_to_json(e) AS row, jsonb_build_array(e.url) AS cursor
  FROM webhook_endpoints e
 WHERE e.tenant_id = %(tenant_id)s AND e.url > coalesce(%(after)s::jsonb->>0, '')
 ORDER BY e.url LIMIT %(limit)s;

-- name: page_jobs
WITH after AS (
    SELECT coalesce((%(after)s::jsonb->>0)::timestamptz, '-infinity') AS at,
           coalesce((%(after)s::jsonb->>1)::uuid, '00000000-0000-0000-0000-000000000000') AS id
), scope AS (
    (SELECT j.* FROM jobs j, after a
      WHERE j.tenant_id = %(tenant_id)s AND j.status = 'queued' AND (j.created_at, j.job_id) > (a.at, a.id)
      ORDER BY j.created_at, j.job_id LIMIT %(limit)s)
    UNION ALL
    (SELECT j.* FROM jobs j, after a
      WHERE j.tenant_id = %(tenant_id)s AND j.status = 'running' AND (j.created_at, j.job_id) > (a.at, a.id)
      ORDER BY j.created_at, j.job_id LIMIT %(limit)s)
)
SELECT row_to_json(s) AS row, jsonb_build_array(s.created_at, s.job_id) AS cursor
  FROM scope s
 ORDER BY s.created_at, s.job_id LIMIT %(limit)s;

-- Steps and ledger rows are paged by blocks of the scope's jobs, in the jobs'
-- keyset order (created_at, job_id): a block of up to `limit` jobs from the
-- partial indexes, then their rows by each table's job_id index, so a page
-- costs the same wherever it starts (no re-sort of every row after the
-- cursor). The page keeps every row of the jobs whose rows start before the
-- limit-th row (rank), so it holds at most limit - 1 + one job's rows. Its
-- last row (`last`) carries no row but the next cursor, the last job taken
-- (NULL at the end of the scope), for moves.scope_page. One statement serves
-- both tables: `table` picks the branch, the other is a one-time filter that
-- reads nothing.

-- name: page_job_rows
WITH after AS (
    SELECT coalesce((%(after)s::jsonb->>0)::timestamptz, '-infinity') AS at,
           coalesce((%(after)s::jsonb->>1)::uuid, '00000000-0000-0000-0000-000000000000') AS id
), block AS (
    SELECT b.created_at, b.job_id FROM (
        (SELECT j.created_at, j.job_id FROM jobs j, after a
          WHERE j.tenant_id = %(tenant_id)s AND j.status = 'queued'
            AND (j.created_at, j.job_id) > (a.at, a.id)
          ORDER BY j.created_at, j.job_id LIMIT %(limit)s)
        UNION ALL
        (SELECT j.created_at, j.job_id FROM jobs j, after a
          WHERE j.tenant_id = %(tenant_id)s AND j.status = 'running'
            AND (j.created_at, j.job_id) > (a.at, a.id)
          ORDER BY j.created_at, j.job_id LIMIT %(limit)s)
    ) b
     ORDER BY b.created_at, b.job_id LIMIT %(limit)s
), rows_of AS (
    SELECT b.created_at, b.job_id, s.step::bigint AS sub, row_to_json(s) AS row
      FROM block b JOIN job_steps s ON s.job_id = b.job_id
     WHERE %(table)s = 'steps'
    UNION ALL
    SELECT b.created_at, b.job_id, l.entry_id AS sub, row_to_json(l) AS row
      FROM block b JOIN ledger l ON l.job_id = b.job_id
     WHERE %(table)s = 'ledger' AND l.tenant_id = %(tenant_id)s
), picked AS (
    SELECT r.*, rank() OVER (ORDER BY r.created_at, r.job_id) AS rows_before FROM rows_of r
)
SELECT p.row, NULL::jsonb AS cursor, false AS last, p.created_at, p.job_id, p.sub
  FROM picked p WHERE p.rows_before <= %(limit)s
UNION ALL
SELECT NULL, CASE
           WHEN EXISTS (SELECT 1 FROM picked WHERE rows_before > %(limit)s) THEN
               (SELECT jsonb_build_array(p.created_at, p.job_id) FROM picked p
                 WHERE p.rows_before <= %(limit)s ORDER BY p.created_at DESC, p.job_id DESC LIMIT 1)
           WHEN (SELECT count(*) FROM block) = %(limit)s THEN
               (SELECT jsonb_build_array(b.created_at, b.job_id) FROM block b
                 ORDER BY b.created_at DESC, b.job_id DESC LIMIT 1)
       END, true, NULL, NULL, NULL
 ORDER BY last, created_at, job_id, sub;

-- name: page_idempotency_keys
SELECT row_to_json(k) AS row, jsonb_build_array(k.key) AS cursor
  FROM idempotency_keys k
 WHERE k.tenant_id = %(tenant_id)s AND k.key > coalesce(%(after)s::jsonb->>0, '')
 ORDER BY k.key LIMIT %(limit)s;

-- name: page_outbox
SELECT row_to_json(o) AS row, jsonb_build_array(o.event_id) AS cursor
  FROM outbox o
 WHERE o.tenant_id = %(tenant_id)s
   AND o.event_id > coalesce((%(after)s::jsonb->>0)::uuid, '00000000-0000-0000-0000-000000000000')
   AND (o.relayed_at IS NULL OR EXISTS (
        SELECT 1 FROM deliveries d WHERE d.event_id = o.event_id AND d.status = 'pending'))
 ORDER BY o.event_id LIMIT %(limit)s;

-- Every schedule, whatever its state (a cancelled or completed one is still
-- read through the API), in the order of the tenant's listing index.

-- name: page_schedules
WITH after AS (
    SELECT coalesce((%(after)s::jsonb->>0)::timestamptz, '-infinity') AS at,
           coalesce((%(after)s::jsonb->>1)::uuid, '00000000-0000-0000-0000-000000000000') AS id
)
SELECT row_to_json(s) AS row, jsonb_build_array(s.created_at, s.schedule_id) AS cursor
  FROM schedules s, after a
 WHERE s.tenant_id = %(tenant_id)s AND (s.created_at, s.schedule_id) > (a.at, a.id)
 ORDER BY s.created_at, s.schedule_id LIMIT %(limit)s;

-- name: page_schedule_runs
-- The run history kept (its retention's worth), by job id: a run's key in
-- tenant_changes (0013).
SELECT row_to_json(r) AS row, jsonb_build_array(r.job_id) AS cursor
  FROM schedule_runs r
 WHERE r.tenant_id = %(tenant_id)s
   AND r.job_id > coalesce((%(after)s::jsonb->>0)::uuid, '00000000-0000-0000-0000-000000000000')
 ORDER BY r.job_id LIMIT %(limit)s;

-- name: read_changes
-- Run while holding the exclusive tenant lock (moves.read_changes): every
-- writer that took a sequence number before has committed, so no entry
-- below the highest one read can still appear later.
SELECT seq, kind, key FROM tenant_changes
 WHERE tenant_id = %(tenant_id)s AND seq > %(after)s
 ORDER BY seq LIMIT %(limit)s;

-- name: count_changes_after
SELECT count(*)::int AS pending, max(seq) AS last_seq FROM tenant_changes
 WHERE tenant_id = %(tenant_id)s AND seq > %(after)s;

-- The current version of changed rows, by the keys the capture recorded.

-- name: changed_tenant
SELECT t.tenant_id AS key, row_to_json(t) AS row FROM tenants t
 WHERE t.tenant_id = %(tenant_id)s AND t.tenant_id = ANY(%(keys)s::text[]);

-- name: changed_wallet
SELECT w.tenant_id AS key, row_to_json(w) AS row FROM wallets w
 WHERE w.tenant_id = %(tenant_id)s AND w.tenant_id = ANY(%(keys)s::text[]);

-- name: changed_rate_bucket
SELECT b.tenant_id AS key, row_to_json(b) AS row FROM rate_buckets b
 WHERE b.tenant_id = %(tenant_id)s AND b.tenant_id = ANY(%(keys)s::text[]);

-- name: changed_targets
SELECT g.name AS key, row_to_json(g) AS row FROM targets g
 WHERE g.tenant_id = %(tenant_id)s AND g.name = ANY(%(keys)s::text[]);

-- name: changed_webhooks
SELECT e.url AS key, row_to_json(e) AS row FROM webhook_endpoints e
 WHERE e.tenant_id = %(tenant_id)s AND e.url = ANY(%(keys)s::text[]);

-- name: changed_jobs
-- Whatever the job's status now: a job finished here stays finished there.
SELECT j.job_id::text AS key, row_to_json(j) AS row FROM jobs j
 WHERE j.tenant_id = %(tenant_id)s AND j.job_id = ANY(%(keys)s::uuid[]);

-- name: changed_steps
SELECT s.job_id::text AS key, row_to_json(s) AS row
  FROM job_steps s JOIN jobs j USING (job_id)
 WHERE j.tenant_id = %(tenant_id)s AND s.job_id = ANY(%(keys)s::uuid[])
 ORDER BY s.job_id, s.step;

-- name: changed_ledger
SELECT l.job_id::text AS key, row_to_json(l) AS row FROM ledger l
 WHERE l.tenant_id = %(tenant_id)s AND l.job_id = ANY(%(keys)s::uuid[])
 ORDER BY l.job_id, l.entry_id;

-- name: changed_idempotency_keys
SELECT k.key AS key, row_to_json(k) AS row FROM idempotency_keys k
 WHERE k.tenant_id = %(tenant_id)s AND k.key = ANY(%(keys)s::text[]);

-- name: changed_outbox
-- Only while undelivered: an event delivered everywhere leaves the scope,
-- and the target forgets it (moves.py sends its key as a delete).
SELECT o.event_id::text AS key, row_to_json(o) AS row FROM outbox o
 WHERE o.tenant_id = %(tenant_id)s AND o.event_id = ANY(%(keys)s::uuid[])
   AND (o.relayed_at IS NULL OR EXISTS (
        SELECT 1 FROM deliveries d WHERE d.event_id = o.event_id AND d.status = 'pending'));

-- name: changed_schedules
SELECT s.schedule_id::text AS key, row_to_json(s) AS row FROM schedules s
 WHERE s.tenant_id = %(tenant_id)s AND s.schedule_id = ANY(%(keys)s::uuid[]);

-- name: changed_schedule_runs
-- A run gone (pruned by its retention) is sent as a delete.
SELECT r.job_id::text AS key, row_to_json(r) AS row FROM schedule_runs r
 WHERE r.tenant_id = %(tenant_id)s AND r.job_id = ANY(%(keys)s::uuid[]);

-- name: freeze_tenant
UPDATE tenants SET state = 'frozen', epoch = %(epoch)s, updated_at = now()
 WHERE tenant_id = %(tenant_id)s;

-- name: max_change_seq
SELECT coalesce(max(seq), 0) AS last_seq, count(*)::int AS pending FROM tenant_changes
 WHERE tenant_id = %(tenant_id)s;

-- name: unfreeze_tenant
UPDATE tenants SET state = 'active', epoch = %(epoch)s, updated_at = now()
 WHERE tenant_id = %(tenant_id)s;

-- name: finish_move_out
UPDATE tenants
   SET state = 'moved', capturing = false,
       purge_after = now() + make_interval(secs => %(retain_seconds)s), updated_at = now()
 WHERE tenant_id = %(tenant_id)s;

-- name: abort_move_out
UPDATE tenants
   SET state = CASE WHEN state = 'frozen' THEN 'active' ELSE state END,
       capturing = false, move_id = NULL, updated_at = now()
 WHERE tenant_id = %(tenant_id)s;

-- name: moved_tenants_to_purge
SELECT tenant_id FROM tenants WHERE state = 'moved' AND purge_after < now() ORDER BY tenant_id;

-- name: lock_moved_tenant_for_purge
SELECT tenant_id FROM tenants
 WHERE tenant_id = %(tenant_id)s AND state = 'moved' AND purge_after < now()
   FOR UPDATE;

-- Target side: every statement runs as the admin path (declare_tenant_admin),
-- and takes only rows of the tenant being moved in.

-- name: movein_find_tenant
SELECT tenant_id, state, move_id FROM tenants WHERE tenant_id = %(tenant_id)s FOR UPDATE;

-- name: movein_create_tenant
-- Frozen until the move activates it: no claim, no submission. No running
-- jobs here, first in the round-robin, under the move's epoch. A source cell
-- before migration 0012 names the running-jobs quota `max_running`; one
-- before 0014 has no strict allowance (NULL: its plan's default, 0014).
INSERT INTO tenants (tenant_id, plan, state, epoch, max_running_jobs, jobs_per_second, burst,
                     daily_spend_limit, strict_schedules, running, last_served_at, api_key_hash,
                     signing_secret, move_id, created_at)
SELECT tenant_id, plan, 'frozen', %(epoch)s,
       coalesce(max_running_jobs, (%(row)s::json->>'max_running')::integer), jobs_per_second, burst,
       daily_spend_limit, strict_schedules, 0, '-infinity', api_key_hash, signing_secret,
       %(move_id)s, created_at
  FROM json_populate_record(null::tenants, %(row)s::json)
 WHERE tenant_id = %(tenant_id)s;

-- name: movein_update_tenant
-- Plan, quotas, key and signing secret follow the source; state, epoch and
-- the counters are this cell's own. `max_running` and a missing
-- `strict_schedules`: as in movein_create_tenant.
UPDATE tenants t
   SET plan = r.plan,
       max_running_jobs = coalesce(r.max_running_jobs, (%(row)s::json->>'max_running')::integer),
       jobs_per_second = r.jobs_per_second,
       burst = r.burst, daily_spend_limit = r.daily_spend_limit,
       strict_schedules = r.strict_schedules,
       api_key_hash = r.api_key_hash,
       signing_secret = r.signing_secret, updated_at = now()
  FROM json_populate_record(null::tenants, %(row)s::json) r
 WHERE t.tenant_id = %(tenant_id)s AND r.tenant_id = t.tenant_id;

-- name: movein_wallet
INSERT INTO wallets (tenant_id, available, reserved, spend_day)
SELECT tenant_id, available, reserved, spend_day
  FROM json_populate_recordset(null::wallets, %(rows)s::json) WHERE tenant_id = %(tenant_id)s
ON CONFLICT (tenant_id) DO UPDATE
   SET available = EXCLUDED.available, reserved = EXCLUDED.reserved, spend_day = EXCLUDED.spend_day;

-- name: movein_rate_bucket
INSERT INTO rate_buckets (tenant_id, tokens, refilled_at)
SELECT tenant_id, tokens, refilled_at
  FROM json_populate_recordset(null::rate_buckets, %(rows)s::json) WHERE tenant_id = %(tenant_id)s
ON CONFLICT (tenant_id) DO UPDATE SET tokens = EXCLUDED.tokens, refilled_at = EXCLUDED.refilled_at;

-- name: movein_targets
INSERT INTO targets (tenant_id, name, url)
SELECT tenant_id, name, url
  FROM json_populate_recordset(null::targets, %(rows)s::json) WHERE tenant_id = %(tenant_id)s
ON CONFLICT (tenant_id, name) DO UPDATE SET url = EXCLUDED.url;

-- name: movein_webhooks
-- Endpoint ids are this cell's own; a new endpoint's breaker starts closed.
INSERT INTO webhook_endpoints (tenant_id, url, secret, max_concurrency)
SELECT tenant_id, url, secret, max_concurrency
  FROM json_populate_recordset(null::webhook_endpoints, %(rows)s::json) WHERE tenant_id = %(tenant_id)s
ON CONFLICT (tenant_id, url) DO UPDATE
   SET secret = EXCLUDED.secret, max_concurrency = EXCLUDED.max_concurrency;

-- name: movein_jobs
-- A job running in the source is queued here: it runs again from its first
-- unsaved step, with the same step idempotency keys, once the tenant is
-- active here. Any other status is copied (a job finished there stays
-- finished here). A row from a cell without priority classes is DEFAULT.
INSERT INTO jobs (job_id, tenant_id, status, target, step_count, payload, attempts, max_attempts,
                  estimate, priority, run_after, expires_at, claim_epoch, claimed_by, lease_until,
                  cancel_requested, redriven_from, redriven_to, last_error, error_code,
                  created_at, started_at, finished_at)
SELECT job_id, tenant_id, CASE WHEN status = 'running' THEN 'queued' ELSE status END, target,
       step_count, payload, attempts, max_attempts, estimate, coalesce(priority, 'DEFAULT'),
       run_after, expires_at,
       claim_epoch, NULL, NULL, cancel_requested, redriven_from, redriven_to, last_error,
       error_code, created_at, started_at, finished_at
  FROM json_populate_recordset(null::jobs, %(rows)s::json) WHERE tenant_id = %(tenant_id)s
ON CONFLICT (job_id) DO UPDATE
   SET status = EXCLUDED.status, target = EXCLUDED.target, step_count = EXCLUDED.step_count,
       payload = EXCLUDED.payload, attempts = EXCLUDED.attempts,
       max_attempts = EXCLUDED.max_attempts, estimate = EXCLUDED.estimate,
       priority = EXCLUDED.priority,
       run_after = EXCLUDED.run_after, expires_at = EXCLUDED.expires_at,
       claim_epoch = EXCLUDED.claim_epoch, claimed_by = NULL, lease_until = NULL,
       cancel_requested = EXCLUDED.cancel_requested, redriven_from = EXCLUDED.redriven_from,
       redriven_to = EXCLUDED.redriven_to, last_error = EXCLUDED.last_error,
       error_code = EXCLUDED.error_code, created_at = EXCLUDED.created_at,
       started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at
 WHERE jobs.tenant_id = EXCLUDED.tenant_id;

-- name: movein_steps
-- Only steps of this tenant's jobs already here: moves.py counts the rest
-- and refuses the batch.
INSERT INTO job_steps (job_id, step, idempotency_key, status, result, attempts, finished_at)
SELECT r.job_id, r.step, r.idempotency_key, r.status, r.result, r.attempts, r.finished_at
  FROM json_populate_recordset(null::job_steps, %(rows)s::json) r
  JOIN jobs j ON j.job_id = r.job_id AND j.tenant_id = %(tenant_id)s
ON CONFLICT (job_id, step) DO UPDATE
   SET idempotency_key = EXCLUDED.idempotency_key, status = EXCLUDED.status,
       result = EXCLUDED.result, attempts = EXCLUDED.attempts, finished_at = EXCLUDED.finished_at;

-- name: movein_ledger
-- Entry ids are this cell's own; (job, kind) stays unique across the move.
INSERT INTO ledger (tenant_id, job_id, kind, amount, created_at)
SELECT tenant_id, job_id, kind, amount, created_at
  FROM json_populate_recordset(null::ledger, %(rows)s::json) WHERE tenant_id = %(tenant_id)s
ON CONFLICT (job_id, kind) DO NOTHING;

-- name: movein_idempotency_keys
INSERT INTO idempotency_keys (tenant_id, key, request_hash, job_id, status_code, response, created_at)
SELECT tenant_id, key, request_hash, job_id, status_code, response, created_at
  FROM json_populate_recordset(null::idempotency_keys, %(rows)s::json) WHERE tenant_id = %(tenant_id)s
ON CONFLICT (tenant_id, key) DO UPDATE
   SET request_hash = EXCLUDED.request_hash, job_id = EXCLUDED.job_id,
       status_code = EXCLUDED.status_code, response = EXCLUDED.response,
       created_at = EXCLUDED.created_at;

-- name: movein_outbox
-- Unrelayed here: fanned out to this cell's endpoints once the tenant is
-- active; receivers deduplicate by event id.
INSERT INTO outbox (event_id, tenant_id, job_id, kind, payload, created_at)
SELECT event_id, tenant_id, job_id, kind, payload, created_at
  FROM json_populate_recordset(null::outbox, %(rows)s::json) WHERE tenant_id = %(tenant_id)s
ON CONFLICT (event_id) DO NOTHING;

-- name: movein_schedules
-- Every column as the source has it: the pending occurrence (next_at,
-- dispatch_at), the state, the job of the latest run, the create key. The
-- dispatcher here carries on from exactly where the source's stopped: an
-- occurrence dispatched there has its run and job here and next_at past it,
-- one not dispatched is due here at the same time, never earlier. A row from
-- a cell without priority classes is DEFAULT.
INSERT INTO schedules (schedule_id, tenant_id, kind, cron, run_at, time_zone, target, payload,
                       max_attempts, misfire_policy, max_catch_up_runs, dispatch_window_seconds,
                       dispatch_offset, priority, state, next_at, dispatch_at, last_job_id,
                       create_key, create_hash, created_at, updated_at)
SELECT schedule_id, tenant_id, kind, cron, run_at, time_zone, target, payload, max_attempts,
       misfire_policy, max_catch_up_runs, dispatch_window_seconds, dispatch_offset,
       coalesce(priority, 'DEFAULT'), state, next_at, dispatch_at, last_job_id, create_key,
       create_hash, created_at, updated_at
  FROM json_populate_recordset(null::schedules, %(rows)s::json) WHERE tenant_id = %(tenant_id)s
ON CONFLICT (schedule_id) DO UPDATE
   SET kind = EXCLUDED.kind, cron = EXCLUDED.cron, run_at = EXCLUDED.run_at,
       time_zone = EXCLUDED.time_zone, target = EXCLUDED.target, payload = EXCLUDED.payload,
       max_attempts = EXCLUDED.max_attempts, misfire_policy = EXCLUDED.misfire_policy,
       max_catch_up_runs = EXCLUDED.max_catch_up_runs,
       dispatch_window_seconds = EXCLUDED.dispatch_window_seconds,
       dispatch_offset = EXCLUDED.dispatch_offset, priority = EXCLUDED.priority,
       state = EXCLUDED.state, next_at = EXCLUDED.next_at, dispatch_at = EXCLUDED.dispatch_at,
       last_job_id = EXCLUDED.last_job_id, create_key = EXCLUDED.create_key,
       create_hash = EXCLUDED.create_hash, created_at = EXCLUDED.created_at,
       updated_at = EXCLUDED.updated_at
 WHERE schedules.tenant_id = EXCLUDED.tenant_id;

-- name: movein_schedule_runs
-- Only runs of this tenant's schedules already here, as for steps: a run of a
-- schedule created after the schedules were paged comes again with the
-- schedule's own change. The run's key is what stops a second job for its
-- occurrence here.
INSERT INTO schedule_runs (schedule_id, scheduled_for, tenant_id, job_id, idempotency_key,
                           dispatched_at)
SELECT r.schedule_id, r.scheduled_for, r.tenant_id, r.job_id, r.idempotency_key, r.dispatched_at
  FROM json_populate_recordset(null::schedule_runs, %(rows)s::json) r
  JOIN schedules s ON s.schedule_id = r.schedule_id AND s.tenant_id = %(tenant_id)s
 WHERE r.tenant_id = %(tenant_id)s
ON CONFLICT (schedule_id, scheduled_for) DO UPDATE
   SET job_id = EXCLUDED.job_id, idempotency_key = EXCLUDED.idempotency_key,
       dispatched_at = EXCLUDED.dispatched_at;

-- name: movein_delete_wallet
DELETE FROM wallets WHERE tenant_id = %(tenant_id)s AND tenant_id = ANY(%(keys)s::text[]);

-- name: movein_delete_rate_bucket
DELETE FROM rate_buckets WHERE tenant_id = %(tenant_id)s AND tenant_id = ANY(%(keys)s::text[]);

-- name: movein_delete_targets
DELETE FROM targets WHERE tenant_id = %(tenant_id)s AND name = ANY(%(keys)s::text[]);

-- name: movein_delete_webhooks
DELETE FROM webhook_endpoints WHERE tenant_id = %(tenant_id)s AND url = ANY(%(keys)s::text[]);

-- name: movein_delete_jobs
-- Their steps go by ON DELETE CASCADE.
DELETE FROM jobs WHERE tenant_id = %(tenant_id)s AND job_id = ANY(%(keys)s::uuid[]);

-- name: movein_delete_steps
DELETE FROM job_steps s USING jobs j
 WHERE j.job_id = s.job_id AND j.tenant_id = %(tenant_id)s AND s.job_id = ANY(%(keys)s::uuid[]);

-- name: movein_delete_ledger
DELETE FROM ledger WHERE tenant_id = %(tenant_id)s AND job_id = ANY(%(keys)s::uuid[]);

-- name: movein_delete_idempotency_keys
DELETE FROM idempotency_keys WHERE tenant_id = %(tenant_id)s AND key = ANY(%(keys)s::text[]);

-- name: movein_delete_outbox
-- Their deliveries and attempts go by ON DELETE CASCADE.
DELETE FROM outbox WHERE tenant_id = %(tenant_id)s AND event_id = ANY(%(keys)s::uuid[]);

-- name: movein_delete_schedule_runs
DELETE FROM schedule_runs WHERE tenant_id = %(tenant_id)s AND job_id = ANY(%(keys)s::uuid[]);

-- name: movein_delete_schedules
-- Their runs go by ON DELETE CASCADE.
DELETE FROM schedules WHERE tenant_id = %(tenant_id)s AND schedule_id = ANY(%(keys)s::uuid[]);

-- name: activate_moved_in
UPDATE tenants SET state = 'active', updated_at = now()
 WHERE tenant_id = %(tenant_id)s AND state = 'frozen' AND move_id = %(move_id)s
RETURNING tenant_id;

-- name: checksum_session
-- Fixed for the transaction of move_checksums, on both sides alike: times
-- are hashed as UTC wall-clock values (UTC has no gap or overlap, so the
-- cast is one-to-one) and the small tables are hashed as text. The plan:
-- no JIT (the row estimates of a hash join over 100k jobs cross its
-- threshold, and compiling costs more than the query), hash joins with a
-- work_mem that keeps them in one batch, never 100k index probes.
SELECT set_config('TimeZone', 'UTC', true), set_config('DateStyle', 'ISO, YMD', true),
       set_config('extra_float_digits', '1', true), set_config('jit', 'off', true),
       set_config('work_mem', '64MB', true), set_config('enable_nestloop', 'off', true),
       set_config('enable_mergejoin', 'off', true);

-- name: move_checksums
-- Count and an order-independent sum of row hashes per table, with one
-- normalization on both sides: a source job running is counted as queued,
-- claim fields and this cell's own ids (ledger entry, endpoint) are left
-- out, and an event's relayed_at too (the target has not fanned it out).
-- Schedules and their runs count every column: they arrive exactly as they
-- are, their pending occurrence and state included. It runs inside the write pause (checksum_session first), so:
-- * A row's hash is the XOR of its columns' own hash functions, each with
--   a seed of its own (a value moved to another column changes the hash; a
--   NULL hashes as the bare seed): no row or value is printed as text, which
--   cost most of the time. The one-row tables are hashed as text.
-- * One statement with no CTE: its branches are independent aggregates, which
--   Postgres runs side by side in parallel workers (Parallel Append).
-- * The jobs in scope are read from the two partial indexes (queued:
--   jobs_queued; running: few), never through the tenant's history; steps and
--   ledger rows are taken by a hash join on those job ids.
-- sum() of bigint adds in 128 bits, no numeric per row.
SELECT 'jobs' AS table, count(*) AS rows, coalesce(sum(
           uuid_hash_extended(j.job_id, 1) # hashtextextended(j.tenant_id, 2)
           # hashtextextended(j.target, 3) # hashint4extended(j.step_count, 4)
           # jsonb_hash_extended(j.payload, 5) # hashint4extended(j.attempts, 6)
           # hashint4extended(j.max_attempts, 7) # hashint8extended(j.estimate, 8)
           # timestamp_hash_extended(j.run_after::timestamp, 9)
           # coalesce(timestamp_hash_extended(j.expires_at::timestamp, 10), 10)
           # hashint4extended(j.cancel_requested::int, 11)
           # coalesce(uuid_hash_extended(j.redriven_from, 12), 12)
           # coalesce(uuid_hash_extended(j.redriven_to, 13), 13)
           # coalesce(hashtextextended(j.last_error, 14), 14)
           # coalesce(hashtextextended(j.error_code, 15), 15)
           # timestamp_hash_extended(j.created_at::timestamp, 16)
           # coalesce(timestamp_hash_extended(j.started_at::timestamp, 17), 17)
           # coalesce(timestamp_hash_extended(j.finished_at::timestamp, 18), 18)
           # hashtextextended(j.priority, 19)), 0)::text
           AS checksum
  FROM (SELECT * FROM jobs WHERE tenant_id = %(tenant_id)s AND status = 'queued'
        UNION ALL
        SELECT * FROM jobs WHERE tenant_id = %(tenant_id)s AND status = 'running') j
UNION ALL
SELECT 'steps', count(*), coalesce(sum(
           uuid_hash_extended(s.job_id, 21) # hashint4extended(s.step, 22)
           # hashtextextended(s.idempotency_key, 23) # hashtextextended(s.status, 24)
           # coalesce(jsonb_hash_extended(s.result, 25), 25) # hashint4extended(s.attempts, 26)
           # coalesce(timestamp_hash_extended(s.finished_at::timestamp, 27), 27)), 0)::text
  FROM (SELECT job_id FROM jobs WHERE tenant_id = %(tenant_id)s AND status = 'queued'
        UNION ALL
        SELECT job_id FROM jobs WHERE tenant_id = %(tenant_id)s AND status = 'running') sc
  JOIN job_steps s ON s.job_id = sc.job_id
UNION ALL
SELECT 'ledger', count(*), coalesce(sum(
           hashtextextended(l.tenant_id, 31) # uuid_hash_extended(l.job_id, 32)
           # hashtextextended(l.kind, 33) # hashint8extended(l.amount, 34)
           # timestamp_hash_extended(l.created_at::timestamp, 35)), 0)::text
  FROM (SELECT job_id FROM jobs WHERE tenant_id = %(tenant_id)s AND status = 'queued'
        UNION ALL
        SELECT job_id FROM jobs WHERE tenant_id = %(tenant_id)s AND status = 'running') sc
  JOIN ledger l ON l.job_id = sc.job_id
 WHERE l.tenant_id = %(tenant_id)s
UNION ALL
SELECT 'wallet', count(*), coalesce(sum(hashtextextended(w::text, 0)), 0)::text
  FROM wallets w WHERE w.tenant_id = %(tenant_id)s
UNION ALL
SELECT 'idempotency_keys', count(*), coalesce(sum(
           hashtextextended(k.tenant_id, 41) # hashtextextended(k.key, 42)
           # hashtextextended(encode(k.request_hash, 'hex'), 43) # uuid_hash_extended(k.job_id, 44)
           # hashint4extended(k.status_code, 45) # jsonb_hash_extended(k.response, 46)
           # timestamp_hash_extended(k.created_at::timestamp, 47)), 0)::text
  FROM idempotency_keys k WHERE k.tenant_id = %(tenant_id)s
UNION ALL
SELECT 'outbox', count(*), coalesce(sum(
           uuid_hash_extended(o.event_id, 51) # hashtextextended(o.tenant_id, 52)
           # coalesce(uuid_hash_extended(o.job_id, 53), 53) # hashtextextended(o.kind, 54)
           # jsonb_hash_extended(o.payload, 55) # timestamp_hash_extended(o.created_at::timestamp, 56)),
           0)::text
  FROM outbox o
 WHERE o.tenant_id = %(tenant_id)s
   AND (o.relayed_at IS NULL OR EXISTS (
        SELECT 1 FROM deliveries d WHERE d.event_id = o.event_id AND d.status = 'pending'))
UNION ALL
SELECT 'targets', count(*), coalesce(sum(hashtextextended(g::text, 0)), 0)::text
  FROM targets g WHERE g.tenant_id = %(tenant_id)s
UNION ALL
SELECT 'webhooks', count(*), coalesce(sum(hashtextextended(ROW(e.url, e.secret, e.max_concurrency)::text,
           0)), 0)::text
  FROM webhook_endpoints e WHERE e.tenant_id = %(tenant_id)s
UNION ALL
SELECT 'schedules', count(*), coalesce(sum(
           uuid_hash_extended(s.schedule_id, 61) # hashtextextended(s.tenant_id, 62)
           # hashtextextended(s.kind, 63) # coalesce(hashtextextended(s.cron, 64), 64)
           # coalesce(timestamp_hash_extended(s.run_at, 65), 65)
           # hashtextextended(s.time_zone, 66) # hashtextextended(s.target, 67)
           # jsonb_hash_extended(s.payload, 68) # hashint4extended(s.max_attempts, 69)
           # hashtextextended(s.misfire_policy, 70) # hashint4extended(s.max_catch_up_runs, 71)
           # hashint4extended(s.dispatch_window_seconds, 72)
           # interval_hash_extended(s.dispatch_offset, 73) # hashtextextended(s.priority, 74)
           # hashtextextended(s.state, 75)
           # coalesce(timestamp_hash_extended(s.next_at::timestamp, 76), 76)
           # coalesce(timestamp_hash_extended(s.dispatch_at::timestamp, 77), 77)
           # coalesce(uuid_hash_extended(s.last_job_id, 78), 78)
           # coalesce(hashtextextended(s.create_key, 79), 79)
           # coalesce(hashtextextended(encode(s.create_hash, 'hex'), 80), 80)
           # timestamp_hash_extended(s.created_at::timestamp, 81)
           # timestamp_hash_extended(s.updated_at::timestamp, 82)), 0)::text
  FROM schedules s WHERE s.tenant_id = %(tenant_id)s
UNION ALL
SELECT 'schedule_runs', count(*), coalesce(sum(
           uuid_hash_extended(r.schedule_id, 91) # timestamp_hash_extended(r.scheduled_for::timestamp, 92)
           # hashtextextended(r.tenant_id, 93) # uuid_hash_extended(r.job_id, 94)
           # hashtextextended(r.idempotency_key, 95)
           # timestamp_hash_extended(r.dispatched_at::timestamp, 96)), 0)::text
  FROM schedule_runs r WHERE r.tenant_id = %(tenant_id)s;
