-- Schedules (0009): the tenant API's statements and the dispatcher's.

-- name: database_now
-- The cell's one clock: a new schedule's first occurrence is the first after it.
SELECT now() AS now;

-- name: lock_strict_allowance
-- Serialises the writes that may add an active strict schedule to a tenant
-- (create, update, resume; domain/strict_allowance.py), held to the end of the
-- transaction: the next one's count (strict_in_use, a new snapshot under READ
-- COMMITTED) sees this one's schedule. An advisory lock rather than the
-- tenant row: every claim and every finished job updates that row (the
-- running counter), and they should not wait for a tenant's API call. Its
-- own class ('CPSA'), apart from the move fence's (0006): a strict write
-- takes this one, then the fence's shared one in its insert's trigger, and
-- the freeze never waits for this one, so the two cannot deadlock.
SELECT pg_advisory_xact_lock(1129337665, cellplane_tenant_lock_key(%(tenant_id)s));

-- name: strict_in_use
-- The tenant's allowance and its active strict schedules but the one being
-- written (NULL: a create). Read after lock_strict_allowance. A tenant row
-- from before 0014 has its plan's default.
SELECT coalesce(t.strict_schedules, cellplane_strict_schedules_default(t.plan)) AS allowance,
       (SELECT count(*) FROM schedules s
         WHERE s.tenant_id = t.tenant_id AND s.state = 'active' AND s.dispatch_window_seconds = 0
           AND s.schedule_id IS DISTINCT FROM %(schedule_id)s::uuid) AS in_use
  FROM tenants t
 WHERE t.tenant_id = %(tenant_id)s;

-- name: insert_schedule
-- ON CONFLICT: a create with the same Idempotency-Key made its schedule
-- already (or is making it: the insert waits for that one to commit).
INSERT INTO schedules (schedule_id, tenant_id, kind, cron, run_at, time_zone, target, payload,
                       max_attempts, misfire_policy, max_catch_up_runs, dispatch_window_seconds,
                       dispatch_offset, priority, state, next_at, dispatch_at, create_key,
                       create_hash)
VALUES (%(schedule_id)s, %(tenant_id)s, %(kind)s, %(cron)s, %(run_at)s, %(time_zone)s, %(target)s,
        %(payload)s, %(max_attempts)s, %(misfire_policy)s, %(max_catch_up_runs)s,
        %(dispatch_window_seconds)s, %(dispatch_offset)s, %(priority)s, %(state)s, %(next_at)s,
        %(next_at)s::timestamptz + %(dispatch_offset)s::interval, %(create_key)s, %(create_hash)s)
ON CONFLICT (tenant_id, create_key) WHERE create_key IS NOT NULL DO NOTHING
RETURNING *;

-- name: schedule_by_create_key
SELECT * FROM schedules WHERE tenant_id = %(tenant_id)s AND create_key = %(create_key)s;

-- name: get_schedule
SELECT * FROM schedules WHERE tenant_id = %(tenant_id)s AND schedule_id = %(schedule_id)s;

-- name: lock_schedule
-- Taken before an update reads whether the schedule is busy: once the lock is
-- held, a dispatcher that was turning an occurrence into a job has committed,
-- and the next statement's snapshot sees its job.
SELECT * FROM schedules WHERE tenant_id = %(tenant_id)s AND schedule_id = %(schedule_id)s
   FOR UPDATE;

-- name: schedule_busy
SELECT EXISTS (SELECT 1 FROM jobs WHERE job_id = %(job_id)s AND status IN ('queued', 'running'))
    AS busy;

-- name: list_schedules
-- Keyset pagination, newest first, like list_jobs.
SELECT * FROM schedules
 WHERE tenant_id = %(tenant_id)s
   AND (%(state)s::text IS NULL OR state = %(state)s::text)
   AND (%(after_created)s::timestamptz IS NULL
        OR (created_at, schedule_id) < (%(after_created)s::timestamptz, %(after_schedule)s::uuid))
 ORDER BY created_at DESC, schedule_id DESC
 LIMIT %(limit)s;

-- name: replace_schedule
-- An update keeps the id (and so the dispatch offset's hash) and the state.
UPDATE schedules
   SET kind = %(kind)s, cron = %(cron)s, run_at = %(run_at)s, time_zone = %(time_zone)s,
       target = %(target)s, payload = %(payload)s, max_attempts = %(max_attempts)s,
       misfire_policy = %(misfire_policy)s, max_catch_up_runs = %(max_catch_up_runs)s,
       dispatch_window_seconds = %(dispatch_window_seconds)s, dispatch_offset = %(dispatch_offset)s,
       priority = %(priority)s,
       state = %(state)s, next_at = %(next_at)s,
       dispatch_at = %(next_at)s::timestamptz + %(dispatch_offset)s::interval, updated_at = now()
 WHERE tenant_id = %(tenant_id)s AND schedule_id = %(schedule_id)s
RETURNING *;

-- name: set_schedule_state
-- Pause, resume and cancel. A resumed schedule keeps its pending occurrence:
-- if that passed while paused, the dispatcher applies the misfire policy.
UPDATE schedules
   SET state = %(state)s,
       next_at = CASE WHEN %(state)s = 'cancelled' THEN NULL ELSE next_at END,
       dispatch_at = CASE WHEN %(state)s = 'cancelled' THEN NULL ELSE dispatch_at END,
       updated_at = now()
 WHERE tenant_id = %(tenant_id)s AND schedule_id = %(schedule_id)s AND state = ANY(%(from)s)
RETURNING *;

-- name: schedule_runs
-- A schedule's run history, newest first: the attempts, outcome and timings
-- are the job's.
SELECT r.scheduled_for, r.idempotency_key, r.dispatched_at, r.job_id, j.status, j.attempts,
       j.started_at, j.finished_at, j.error_code
  FROM schedule_runs r LEFT JOIN jobs j USING (job_id)
 WHERE r.schedule_id = %(schedule_id)s
   AND (%(before)s::timestamptz IS NULL OR r.scheduled_for < %(before)s::timestamptz)
 ORDER BY r.scheduled_for DESC
 LIMIT %(limit)s;

-- name: lock_due_schedules
-- Active schedules whose pending occurrence is due by the database's clock
-- (its scheduled time plus its offset in the window), each locked for the
-- dispatcher that takes it; SKIP LOCKED lets another dispatcher take the
-- next ones instead of waiting. A schedule another dispatcher has just moved
-- on is rechecked against its new dispatch_at when the lock is taken, and
-- passed over. Schedules of tenants that are paused, moving or gone wait.
SELECT s.schedule_id, s.tenant_id, s.kind, s.cron, s.run_at, s.time_zone, s.target, s.payload,
       s.max_attempts, s.misfire_policy, s.max_catch_up_runs, s.dispatch_offset, s.next_at,
       s.priority, now() AS now
  FROM schedules s JOIN tenants t USING (tenant_id)
 WHERE s.state = 'active' AND s.dispatch_at <= now() AND t.state = 'active'
 ORDER BY s.dispatch_at
 LIMIT %(batch)s
   FOR UPDATE OF s SKIP LOCKED;

-- name: insert_run
-- The key (schedule, scheduled time) is the guarantee of one job per
-- occurrence: a second insert of the same occurrence conflicts and makes no job.
INSERT INTO schedule_runs (schedule_id, scheduled_for, tenant_id, job_id, idempotency_key)
VALUES (%(schedule_id)s, %(scheduled_for)s, %(tenant_id)s, %(job_id)s, %(idempotency_key)s)
ON CONFLICT (schedule_id, scheduled_for) DO NOTHING
RETURNING job_id;

-- name: insert_scheduled_job
-- Queued now: run_after defaults to now(), which is at or after the
-- occurrence's dispatch time, itself at or after its scheduled time. The job
-- is in the schedule's priority class.
INSERT INTO jobs (job_id, tenant_id, status, target, step_count, payload, max_attempts, estimate,
                  priority)
VALUES (%(job_id)s, %(tenant_id)s, 'queued', %(target)s, 1, %(payload)s, %(max_attempts)s, 0,
        %(priority)s);

-- name: insert_scheduled_step
-- The run's key, the same on every try of this run, is what the target sees.
INSERT INTO job_steps (job_id, step, idempotency_key, status)
VALUES (%(job_id)s, 1, %(idempotency_key)s, 'pending');

-- name: advance_schedule
-- Conditional on the occurrence the dispatcher planned from, so a plan made
-- from a stale read changes nothing. No next occurrence: the schedule is done.
UPDATE schedules
   SET next_at = %(next_at)s,
       dispatch_at = %(next_at)s::timestamptz + dispatch_offset,
       state = CASE WHEN %(next_at)s::timestamptz IS NULL THEN 'completed' ELSE state END,
       last_job_id = coalesce(%(last_job_id)s, last_job_id),
       updated_at = now()
 WHERE schedule_id = %(schedule_id)s AND next_at = %(planned_from)s
RETURNING schedule_id;

-- name: prune_schedule_runs
-- Run history is kept for a retention; the jobs themselves are not touched.
-- Not the runs of a tenant frozen for a move or moved out: the fence (0006)
-- would refuse the whole statement, every tenant's pruning with it. A move's
-- capture sends the source's prunings as deletes (0013); a moved-out copy
-- goes whole with its purge.
DELETE FROM schedule_runs r
 WHERE r.dispatched_at < now() - make_interval(days => %(days)s)
   AND r.tenant_id NOT IN (SELECT t.tenant_id FROM tenants t WHERE t.state IN ('frozen', 'moved'));
